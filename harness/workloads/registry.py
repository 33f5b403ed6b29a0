"""Dataset names to datasets: the built-ins, those registered by entry point, and those registered in code.

A dataset is one module (``harness.workloads.base.Dataset``: a name, a frozen dataclass of its own
settings, whether it takes images, and ``sample``). Its flags appear in every parser built after it
is registered, ``build_workload`` samples it by ``--dataset-name``, its settings are recorded in run
files and compared by ``harness.analysis.like_for_like``. Register in code::

    register_dataset(MyDataset())

or, from another package, by entry point (an object, or a class taking no arguments)::

    [project.entry-points."wirebench.datasets"]
    my-dataset = "my_package.my_module:MyDataset"
"""

from __future__ import annotations

import warnings
from importlib.metadata import entry_points
from typing import TypeVar

from harness.settings.declare import declared
from harness.workloads.base import Dataset
from harness.workloads.custom import CUSTOM
from harness.workloads.multi_turn import MULTI_TURN
from harness.workloads.random_dataset import RANDOM
from harness.workloads.random_mm import RANDOM_MM
from harness.workloads.sharegpt import SHAREGPT
from harness.workloads.sonnet import SONNET
from harness.workloads.trace import TRACE

ENTRY_POINT_GROUP = "wirebench.datasets"
D = TypeVar("D", bound=Dataset)

_datasets: dict[str, Dataset] = {}
_entry_points_loaded = False


def register_dataset(dataset: D) -> D:
    """Add ``dataset``; ValueError when its name or one of its flags is another dataset's."""
    if dataset.name in _datasets and _datasets[dataset.name] is not dataset:
        raise ValueError(f"a dataset named {dataset.name!r} is already registered")
    others = [other for other in _datasets.values() if other is not dataset]
    taken = {d.dest: other.name for other in others if not _inherits(dataset, other) for d in declared(other.options)}
    for d in declared(dataset.options):
        if d.dest in taken:
            raise ValueError(f"dataset {dataset.name!r}: {d.spec.flag} is already dataset {taken[d.dest]!r}'s")
    _datasets[dataset.name] = dataset
    return dataset


def _inherits(a: Dataset, b: Dataset) -> bool:
    """Whether one dataset's options extend the other's, so that they share its flags (random-mm's
    text settings are random's); the same class for both shares nothing."""
    if a.options is b.options:
        return False
    return issubclass(a.options, b.options) or issubclass(b.options, a.options)


def unregister_dataset(name: str) -> None:
    """Remove a dataset registered in code (a test's, when it is done)."""
    _datasets.pop(name, None)


def _load_entry_points() -> None:
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in _datasets:
            continue
        try:
            found = ep.load()
            register_dataset(found() if isinstance(found, type) else found)
        except Exception as exc:  # a broken plugin must not take every command down with it
            warnings.warn(f"dataset entry point {ep.name!r} ({ep.value}) not loaded: {exc}", stacklevel=2)


def datasets() -> list[Dataset]:
    """Every registered dataset, built-ins first."""
    _load_entry_points()
    return list(_datasets.values())


def dataset_names() -> tuple[str, ...]:
    return tuple(d.name for d in datasets())


def get_dataset(name: str) -> Dataset:
    """The dataset called ``name``; ValueError naming the known ones otherwise."""
    found = {d.name: d for d in datasets()}.get(name)
    if found is None:
        raise ValueError(f"unknown --dataset-name {name!r}; choose from {', '.join(dataset_names())}")
    return found


for _builtin in (SONNET, RANDOM, RANDOM_MM, SHAREGPT, CUSTOM, TRACE, MULTI_TURN):
    register_dataset(_builtin)
