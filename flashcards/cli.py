"""The ``flashcards`` command: drill in a terminal, statistics, lists, exports.

    flashcards drill [--up-to NN] [--tag T] [--notebook N] [--new N]
                                                           review due cards (keys: Space, 1-4, u, q)
    flashcards stats [--plot out.png]                      counts, due forecast, reviews/day, retention
    flashcards list [--tag T] [--notebook N]               cards with their state and due date
    flashcards check                                       recompute every number the cards state
    flashcards export-anki deck.apkg                       Anki package (notes update on re-import)
    flashcards export-json history.json / import-json history.json
    flashcards unsuspend CARD-ID                           bring back a suspended leech

Every command takes ``--db PATH`` (default: ``$DISTLAB_FLASHCARDS_DB`` or the user data
directory) and ``--deck DIR`` (default: the course deck). A ``--tag`` that no card has is
refused with the deck's tags (:func:`check_tag`), as is a file at ``--db`` that is not a
SQLite database (:class:`flashcards.store.StoreError`); each is one ``error:`` line, exit 2.
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TextIO

from rich import box
from rich.columns import Columns
from rich.console import Console, ConsoleOptions, Group, RenderResult
from rich.markdown import Markdown
from rich.measure import Measurement
from rich.padding import Padding
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from flashcards.anki import export_apkg
from flashcards.checks import run_checks
from flashcards.course_order import in_course_order, up_to_notebook
from flashcards.history import export_json, import_json
from flashcards.model import Card, Deck, load_deck
from flashcards.render import to_terminal
from flashcards.scheduler import DEFAULT_RETENTION, NEW_PER_DAY, RATING_KEYS, format_interval
from flashcards.session import DrillSession
from flashcards.stats import compute_stats, plot_stats
from flashcards.store import Store

QUIT = "q"


# -- keys ---------------------------------------------------------------------------------
def key_reader(stream: TextIO) -> Callable[[], str]:
    """One key per call: a raw keypress on a terminal (no Enter needed), else one line of
    piped input (its first character; an empty line means Enter). End of input is quit."""
    if stream.isatty():
        try:
            import termios
            import tty
        except ImportError:  # Windows: no termios, fall back to lines
            pass
        else:
            return lambda: _read_raw_key(stream, termios, tty)

    def read_line() -> str:
        line = stream.readline()
        if line == "":
            return QUIT
        line = line.strip()
        return line[0] if line else "\n"

    return read_line


def _read_raw_key(stream: TextIO, termios, tty) -> str:
    fd = stream.fileno()
    saved = termios.tcgetattr(fd)
    try:
        tty.setraw(fd)
        key = os.read(fd, 1).decode(errors="replace")
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)
    if key in ("", "\x03", "\x04", "\x1b"):  # EOF, Ctrl-C, Ctrl-D, Esc
        return QUIT
    return "\n" if key == "\r" else key


# -- drill --------------------------------------------------------------------------------
def run_drill(session: DrillSession, console: Console, read_key: Callable[[], str]) -> int:
    """The terminal drill loop; returns the number of reviews made (net of undos)."""
    reviewed = 0
    while True:
        card = session.current
        if card is None:
            later = session.next_due
            when = (
                ""
                if later is None
                else f" Next card due in {format_interval(later - session.now())}."
            )
            console.print(f"[bold]Nothing due now.[/]{when}")
            if not session.can_undo:
                break
            console.print("[dim]u: undo the last review   any other key: quit[/]")
            if read_key() != "u":
                break
            reviewed -= _undo(session, console)
            continue
        _show(console, session, card.q, title=card.notebook)
        console.print("[dim]Space/Enter: show answer   u: undo   q: quit[/]")
        key = read_key()
        if key == "u":
            reviewed -= _undo(session, console)
            continue
        if key == QUIT:
            break
        shown = time.monotonic()
        console.print(Panel(card_markdown(card.a), title="answer", title_align="left"))
        console.print(
            "   ".join(f"[bold]{int(r)}[/] {label}" for r, label in session.labels().items())
        )
        while (key := read_key()) not in RATING_KEYS and key not in (QUIT, "u"):
            console.print("[dim]1 Again, 2 Hard, 3 Good, 4 Easy (u: undo, q: quit)[/]")
        if key == "u":
            reviewed -= _undo(session, console)
            continue
        if key == QUIT:
            break
        result = session.rate(RATING_KEYS[key], duration_ms=int((time.monotonic() - shown) * 1000))
        reviewed += 1
        if result.became_leech:
            console.print(
                f"[bold red]{card.slug} is a leech[/] ({result.state.lapses} lapses): tagged and "
                f"suspended. Study {card.notebook}, then `flashcards unsuspend {card.slug}`."
            )
    console.print(f"Reviewed {reviewed} card(s) in this drill, {session.reviewed_today} today.")
    return reviewed


def _show(console: Console, session: DrillSession, question: str, *, title: str) -> None:
    c = session.counts
    console.rule(
        f"[blue]New {c.new}[/] · [red]Learning {c.learning}[/] · [green]Review {c.review}[/]"
        f"   reviewed today: {session.reviewed_today}"
    )
    state = session.state_of(session.current)
    badge = "new" if state is None else state.card.state.name.lower()
    panel = Panel(card_markdown(question), title=f"{title} · {badge}", title_align="left")
    console.print(panel)


def card_markdown(text: str) -> Markdown:
    """A card side as the terminal drill shows it: Markdown, with math read as plain Unicode
    (``$A = [A_1 \\mid A_2]$`` shows as ``A = [A₁ | A₂]``, see :func:`flashcards.render.tex_to_text`)."""
    return Markdown(to_terminal(text))


def _undo(session: DrillSession, console: Console) -> int:
    """Undo this drill's last review; returns how many reviews were undone (0 or 1)."""
    if not session.can_undo:
        console.print("[dim]nothing to undo[/]")
        return 0
    card = session.undo()
    console.print(f"Undid the last review of {card.slug}.")
    return 1


def _plural(n: int, noun: str) -> str:
    return noun if n == 1 else f"{noun}s"


# -- commands -----------------------------------------------------------------------------
def _session(args: argparse.Namespace) -> DrillSession:
    deck = _deck(args)
    check_tag(deck, args.tag)
    return DrillSession(
        deck,
        Store(args.db),
        tag=args.tag,
        notebook=args.notebook,
        up_to=args.up_to,
        new_per_day=args.new,
        desired_retention=args.retention,
        clock=_clock(args),
    )


def _deck(args: argparse.Namespace) -> Deck:
    return load_deck(args.deck)


def check_tag(deck: Deck, tag: str | None) -> None:
    """A ``ValueError`` for a ``--tag`` that no card of ``deck`` has (a typo would otherwise
    select nothing without a word), naming the closest tags and every tag of the deck."""
    if tag is None or tag in deck.tags:
        return
    close = difflib.get_close_matches(tag, deck.tags, n=3)
    hint = f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""
    raise ValueError(
        f"unknown tag {tag!r}{hint}: no card of this deck has it; tags in this deck: "
        f"{', '.join(deck.tags)}"
    )


def _selected(args: argparse.Namespace) -> list[Card]:
    """The cards ``--tag``, ``--notebook`` and ``--up-to`` select, in course order; an
    unknown ``--tag`` is refused (:func:`check_tag`)."""
    deck = _deck(args)
    check_tag(deck, args.tag)
    cards = deck.filter(tag=args.tag, notebook=args.notebook)
    if args.up_to is not None:
        cards = up_to_notebook(cards, args.up_to)
    return in_course_order(cards)


def _iso_time(text: str) -> datetime:
    """``--now``: an ISO 8601 time (UTC if it names no zone)."""
    try:
        fixed = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected an ISO 8601 time such as 2026-01-31T09:00, got {text!r}"
        ) from None
    return fixed.replace(tzinfo=UTC) if fixed.tzinfo is None else fixed


def _clock(args: argparse.Namespace) -> Callable[[], datetime] | None:
    if args.now is None:
        return None
    fixed = args.now
    return lambda: fixed


def cmd_drill(args: argparse.Namespace, console: Console) -> int:
    run_drill(_session(args), console, key_reader(sys.stdin))
    return 0


def cmd_stats(args: argparse.Namespace, console: Console) -> int:
    session = _session(args)
    stats = compute_stats(session.cards, session.store, now=session.now(), days=args.days)
    table = Table(title="Cards", show_header=False)
    for name in ("cards", "new", "learning", "review", "suspended", "leeches"):
        table.add_row(name, str(getattr(stats, name)))
    retention = "n/a" if stats.retention is None else f"{stats.retention:.1%}"
    table.add_row(
        "true retention", f"{retention} of {stats.retention_reviews} reviews ({args.days} days)"
    )
    c = session.counts
    table.add_row("due now", f"{c.new} new, {c.learning} learning, {c.review} review")
    console.print(table)
    forecast = Table(title="Due forecast (next 14 days)")
    forecast.add_column("day")
    forecast.add_column("due", justify="right")
    for day, n in stats.due_forecast[:14]:
        forecast.add_row(day.isoformat(), str(n))
    done = Table(title="Reviews per day (last 14 days)")
    done.add_column("day")
    done.add_column("reviews", justify="right")
    for day, n in stats.reviews_per_day[-14:]:
        done.add_row(day.isoformat(), str(n))
    console.print(Columns([forecast, done]))
    if args.plot:
        suffix = os.path.splitext(args.plot)[1].lower()
        if suffix not in (".png", ".svg", ".pdf"):
            raise ValueError(
                f"--plot {args.plot!r}: the file name must end in .png, .svg or .pdf "
                f"(got {suffix or 'no suffix'})"
            )
        console.print(f"figure written to {plot_stats(stats, args.plot)}")
    return 0


class Breakable:
    """Text that a table cell wraps at spaces, after a ``-`` and before a ``#``, never inside a
    word; ``\\n`` forces a break.

    Notebook anchors and tags are long hyphenated slugs (``07-tensor-and-sequence-parallelism``);
    rich wraps only at spaces and folds the rest mid-word (``07-tensor-an`` / ``d-sequence``).
    """

    _PIECE = re.compile(r"#?[^\s#-]*-+|#?[^\s#-]+|[ \t]+|\n")

    def __init__(self, text: str) -> None:
        self.text = text

    def pieces(self) -> list[str]:
        return self._PIECE.findall(self.text)

    def lines(self, width: int) -> list[str]:
        """Greedy wrap to ``width``; a piece longer than ``width`` stays whole."""
        lines, line, space = [], "", False
        for piece in self.pieces():
            if piece == "\n":
                lines.append(line)
                line, space = "", False
            elif piece.isspace():
                space = bool(line)
            else:
                joined = line + (" " if space else "") + piece
                if line and len(joined) > width:
                    lines.append(line)
                    joined = piece
                line, space = joined, False
        return [*lines, line]

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        words = [p for p in self.pieces() if not p.isspace()]
        longest_line = max(len(line) for line in self.text.split("\n"))
        return Measurement(max(map(len, words), default=0), longest_line)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield Text("\n".join(self.lines(options.max_width)), no_wrap=True, overflow="ignore")


def cmd_list(args: argparse.Namespace, console: Console) -> int:
    states = Store(args.db).card_states()
    cards = _selected(args)
    rows = []
    for card in cards:
        s = states.get(card.card_id)
        if s is None:
            state, due = "new", ""
        else:
            state = "suspended" if s.suspended else s.card.state.name.lower()
            state += " (leech)" if s.leech else ""
            due = s.card.due.strftime("%Y-%m-%d %H:%M")
        rows.append((card, " ".join(card.tags), state, due))
    # The id is what `flashcards unsuspend` takes: never cut or wrapped, at any terminal
    # width; the other columns wrap at spaces and hyphens, never inside a word (Breakable).
    # One line per card when the widest row fits; otherwise (80 columns hold the id, the tags,
    # the state and the date, no more) the notebook goes under the id instead of being wrapped
    # into a narrow column of its own.
    id_width = max((len(c.slug) for c in cards), default=2)
    for stacked in (False, True):
        table = Table(box=box.SIMPLE_HEAD, title=f"{len(cards)} {_plural(len(cards), 'card')}")
        if stacked:
            table.add_column("id / notebook", width=id_width)
        else:
            table.add_column("id", no_wrap=True, min_width=id_width)
        for column in ("tags", "state", "due") if stacked else ("tags", "notebook", "state", "due"):
            table.add_column(column)
        for card, tags, state, due in rows:
            if stacked:
                first = Group(card.slug, Padding(Breakable(card.notebook), (0, 0, 0, 2)))
                table.add_row(first, *(Breakable(cell) for cell in (tags, state, due)))
            else:
                cells = (tags, card.notebook, state, due)
                table.add_row(card.slug, *(Breakable(cell) for cell in cells))
        wide = console.options.update_width(10_000)
        if Measurement.get(console, wide, table).maximum <= console.width:
            break
    console.print(table)
    return 0


def cmd_check(args: argparse.Namespace, console: Console) -> int:
    results = run_checks(_deck(args))
    failed = [r for r in results if not r.ok]
    for r in failed:
        console.print(r.message(), markup=False, highlight=False)
    console.print(f"{len(results) - len(failed)} of {len(results)} checks pass")
    return 1 if failed else 0


def cmd_export_anki(args: argparse.Namespace, console: Console) -> int:
    cards = _selected(args)
    path = export_apkg(cards, args.path)
    notes = len({card.note for card in cards})  # a cloze note holds several cards
    console.print(f"wrote {notes} notes ({len(cards)} cards) to {path}")
    return 0


def cmd_export_json(args: argparse.Namespace, console: Console) -> int:
    n = export_json(Store(args.db), args.path)
    console.print(f"wrote {n} reviews to {args.path}")
    return 0


def cmd_import_json(args: argparse.Namespace, console: Console) -> int:
    n = import_json(Store(args.db), args.path)
    console.print(f"imported {n} new reviews from {args.path}")
    return 0


def cmd_unsuspend(args: argparse.Namespace, console: Console) -> int:
    card = _deck(args).by_slug(args.card)
    Store(args.db).set_suspended(card.card_id, False)
    console.print(f"{card.slug} is back in the queue")
    return 0


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--db", help="review database (default: $DISTLAB_FLASHCARDS_DB or the user data dir)"
    )
    common.add_argument("--deck", help="deck folder or card file (default: the course deck)")
    common.add_argument("--now", type=_iso_time, help=argparse.SUPPRESS)  # fixed time, for tests
    selection = argparse.ArgumentParser(add_help=False)
    selection.add_argument("--tag", help="only cards with this tag")
    selection.add_argument(
        "--notebook", help="only cards of this notebook folder or folder#section"
    )
    selection.add_argument(
        "--up-to",
        metavar="NN",
        help="only cards of notebooks 00 to NN, the ones done so far (e.g. 03)",
    )

    parser = argparse.ArgumentParser(
        prog="flashcards", description="distlab flashcards (FSRS spaced repetition)"
    )
    sub = parser.add_subparsers(dest="command", required=True)

    def add(name: str, func, help_: str, parents=(common,)) -> argparse.ArgumentParser:
        p = sub.add_parser(name, parents=list(parents), help=help_)
        p.set_defaults(func=func)
        return p

    for name, func, help_ in (
        ("drill", cmd_drill, "review due cards"),
        ("stats", cmd_stats, "statistics"),
    ):
        p = add(name, func, help_, (common, selection))
        p.add_argument(
            "--new", type=int, default=NEW_PER_DAY, help="new cards per day (default 20)"
        )
        p.add_argument(
            "--retention", type=float, default=DEFAULT_RETENTION, help="FSRS desired retention"
        )
    sub.choices["stats"].add_argument(
        "--days", type=int, default=30, help="window in days (default 30)"
    )
    sub.choices["stats"].add_argument("--plot", help="write a figure (PNG/SVG/PDF) to this path")
    add("list", cmd_list, "list cards and their state", (common, selection))
    add("check", cmd_check, "recompute the numbers stated on cards")
    add("export-anki", cmd_export_anki, "write an Anki .apkg", (common, selection)).add_argument(
        "path"
    )
    add("export-json", cmd_export_json, "write the review history as JSON").add_argument("path")
    add("import-json", cmd_import_json, "merge a JSON review history").add_argument("path")
    add("unsuspend", cmd_unsuspend, "unsuspend a card (e.g. a leech)").add_argument("card")
    return parser


def main(argv: list[str] | None = None, *, console: Console | None = None) -> int:
    args = build_parser().parse_args(argv)
    console = console or Console()
    try:
        return args.func(args, console)
    except (ValueError, TypeError, KeyError, OSError) as exc:
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        print(f"flashcards: error: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
