"""Named-axis notation for sharded arrays: ``A[I, J_x]``.

An array's dimensions get names (``I``, ``J``, ``K``); a dimension split over a mesh axis
carries that axis as a subscript. On a mesh ``{"x": 4}`` (four ranks along one axis named
``x``), ``A[I, J_x]`` means every rank holds all ``I`` rows and one quarter of the ``J``
columns: rank ``r`` holds block ``r`` of ``J``. A dimension without a subscript is whole
(replicated) on every rank. The notation follows "How to Scale Your Model" (Austin et al.
2025, part 3, "Sharded matrices and how to multiply them").

One rule makes a sharding valid: a mesh axis splits at most one dimension of an array.
``A[I_x, J_x]`` would give rank ``r`` block ``(r, r)`` only, the diagonal: not the array.

Pure Python: parsing and shapes, no torch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from distlab.core.checks import positive_int

_ARRAY = re.compile(r"^\s*([A-Za-z]\w*)\s*\[(.*)\]\s*$")
_DIM = re.compile(r"^([A-Za-z][A-Za-z0-9]*)(?:_([A-Za-z]\w*))?$")


@dataclass(frozen=True)
class Dim:
    """One named dimension; ``mesh_axis`` is the mesh axis that splits it, or None (whole)."""

    name: str
    mesh_axis: str | None = None

    def __str__(self) -> str:
        return self.name if self.mesh_axis is None else f"{self.name}_{self.mesh_axis}"


@dataclass(frozen=True)
class Sharded:
    """An array's name and its dimensions, each whole or split over one mesh axis."""

    name: str
    dims: tuple[Dim, ...]

    def __post_init__(self) -> None:
        names = [d.name for d in self.dims]
        if len(set(names)) != len(names):
            raise ValueError(f"{self}: a dimension name appears twice in {names}")
        axes = [d.mesh_axis for d in self.dims if d.mesh_axis is not None]
        if len(set(axes)) != len(axes):
            raise ValueError(
                f"{self}: mesh axis {axes[0]!r} splits two dimensions; a mesh axis may split "
                "one dimension of an array (on both, each rank would hold a diagonal block)"
            )

    def __str__(self) -> str:
        return f"{self.name}[{', '.join(map(str, self.dims))}]"

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(d.name for d in self.dims)

    def axis_of(self, dim: str) -> str | None:
        """The mesh axis that splits dimension ``dim`` (None: whole); KeyError names the dims."""
        for d in self.dims:
            if d.name == dim:
                return d.mesh_axis
        raise KeyError(f"{self} has no dimension {dim!r}; its dimensions are {self.names}")

    def index_of(self, dim: str) -> int:
        self.axis_of(dim)  # the KeyError that names the dimensions
        return self.names.index(dim)

    def with_axis(self, dim: str, mesh_axis: str | None, name: str | None = None) -> Sharded:
        """The same array with dimension ``dim`` split over ``mesh_axis`` (None: whole)."""
        self.axis_of(dim)
        dims = tuple(Dim(d.name, mesh_axis) if d.name == dim else d for d in self.dims)
        return Sharded(name or self.name, dims)

    def sharded_dims(self) -> tuple[str, ...]:
        return tuple(d.name for d in self.dims if d.mesh_axis is not None)

    def local_shape(self, sizes: dict[str, int], mesh: dict[str, int]) -> tuple[int, ...]:
        """The block one rank holds: each split dimension divided by its mesh axis's size."""
        shape = []
        for d in self.dims:
            size = positive_int(f"size of {d.name}", sizes.get(d.name, 0) or 0)
            parts = 1 if d.mesh_axis is None else mesh_size(mesh, d.mesh_axis)
            if size % parts:
                raise ValueError(
                    f"{self}: dimension {d.name} of size {size} does not split into "
                    f"{parts} equal blocks over mesh axis {d.mesh_axis!r}"
                )
            shape.append(size // parts)
        return tuple(shape)

    def elements(self, sizes: dict[str, int], mesh: dict[str, int]) -> int:
        """Elements in one rank's block."""
        count = 1
        for extent in self.local_shape(sizes, mesh):
            count *= extent
        return count


def sharded(text: str | Sharded) -> Sharded:
    """Parse ``"A[I, J_x]"``; a :class:`Sharded` passes through.

    >>> str(sharded("B[J_x,K]"))
    'B[J_x, K]'
    """
    if isinstance(text, Sharded):
        return text
    if not isinstance(text, str):
        raise TypeError(f"a sharding is a string such as 'A[I, J_x]', got {text!r}")
    match = _ARRAY.match(text)
    if not match:
        raise ValueError(f"{text!r} is not NAME[DIM, DIM_axis, ...], e.g. 'A[I, J_x]'")
    dims = []
    for part in match.group(2).split(","):
        dim = _DIM.match(part.strip())
        if not dim:
            raise ValueError(
                f"{text!r}: {part.strip()!r} is not a dimension; write a name (I) or a name "
                "split over a mesh axis (I_x)"
            )
        dims.append(Dim(dim.group(1), dim.group(2)))
    return Sharded(match.group(1), tuple(dims))


def mesh_size(mesh: dict[str, int], axis: str) -> int:
    """The number of ranks along ``axis``; KeyError names the mesh's axes."""
    if axis not in mesh:
        raise KeyError(f"mesh axis {axis!r} is not in the mesh {mesh}")
    return positive_int(f"mesh axis {axis!r}", mesh[axis])


def one_axis_mesh(mesh: dict[str, int]) -> tuple[str, int]:
    """(axis name, size) of a one-axis mesh such as ``{"x": 4}``; ValueError otherwise."""
    if not isinstance(mesh, dict) or len(mesh) != 1:
        raise ValueError(
            f"the matmul plans work on a mesh with one axis, such as {{'x': 4}}; got {mesh!r}"
        )
    (axis,) = mesh
    return axis, mesh_size(mesh, axis)
