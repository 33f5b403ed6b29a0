"""What SGLang's CPU path imports but this CPU venv lacks, stood in for loudly.

Installed by :mod:`harness.sglang_hook.startup` in ``.venv-sglang`` only, as an import hook: nothing is
imported until SGLang asks for the module concerned, and a real module found on the path always wins.

- ``torchvision``: the only build on the package index here is a CUDA one; beside the CPU torch its C
  extension does not load, and its Python side then stops at import on ``register_fake("torchvision::nms")``
  ("operator torchvision::nms does not exist"). SGLang imports torchvision's transforms at start (its model
  configs import image helpers), and transformers imports it whenever it is installed. The hook defines the
  two operator *schemas* that import needs (``nms``, ``qnms``) with no kernel, and only when torchvision's
  own C extension failed to load. Safe: a schema is not an implementation; a call of either operator still
  fails, saying the operator has no kernel for CPU, and torchvision's own ops check
  (``_assert_has_ops``) still refuses every C op. A text model never calls them.
- ``sgl_kernel``: the packages on the index hold CUDA code only. With ``SGLANG_USE_CPU_ENGINE=1`` SGLang's
  modules import CPU ops from it by name at start (:data:`SGL_KERNEL_NAMES`, each with where it is imported
  and why it is never called here). Every one is called only by speculative decoding, which the servers
  wirebench starts never enable (no ``--speculative-algorithm``). The stand-in holds exactly those names,
  each raising :class:`StandInCalled` naming itself when called; any other name is an ImportError, as for a
  missing module. The stand-in registers no torch operator, so ``torch.ops.sgl_kernel`` stays empty: SGLang's
  own probe for its AMX CPU kernels (``convert_weight_packed``) still finds none, and every path using those
  kernels stays off.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

STANDIN_NAME = "sgl_kernel"
# What SGLang 0.5.23's CPU path imports from sgl_kernel at start (server start and a served request, seen
# by a stand-in that logged every name asked of it), with the one caller path of each: all speculative
# decoding, never enabled by wirebench, so never called.
SGL_KERNEL_CALLERS = {
    # kernels/ops/kvcache/cache_move.py: a KV pool's move_kv_cache and its copy warm-up, which run only in a
    # pool built with enable_kv_cache_copy, which SGLang sets only with a speculative algorithm.
    "copy_all_layer_kv_cache_cpu": "speculative decoding (KV cache moves)",
    # srt/mem_cache/allocation.py: assign_req_to_token_pool_func, called only by alloc_for_spec_decode and
    # the speculative workers.
    "assign_req_to_token_pool_cpu": "speculative decoding (draft token slots)",
    # kernels/ops/speculative/spec_tree.py, cache_locs.py, eagle.py: the speculative decoding kernels.
    "build_tree_kernel_efficient_cpu": "speculative decoding (draft tree)",
    "verify_tree_greedy_cpu": "speculative decoding (draft verification)",
    "assign_draft_cache_locs_contiguous_cpu": "speculative decoding (draft cache slots)",
    "assign_extend_cache_locs_cpu": "speculative decoding (draft cache slots)",
    "fill_accept_out_cache_loc_cpu": "speculative decoding (accepted tokens)",
    "fill_bonus_tokens_cpu": "speculative decoding (bonus tokens)",
}
SGL_KERNEL_NAMES = tuple(SGL_KERNEL_CALLERS)
TORCHVISION_SCHEMAS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
)


class StandInCalled(RuntimeError):
    """A stand-in was called: SGLang took a path this CPU venv was not made for."""


def _loud(name: str) -> Callable[..., NoReturn]:
    def stand_in(*args: Any, **kwargs: Any) -> NoReturn:
        raise StandInCalled(
            f"wirebench stand-in {STANDIN_NAME}.{name} was called ({SGL_KERNEL_CALLERS[name]}): SGLang's CPU "
            "venv has no sgl_kernel (its packages are CUDA only); this path needs a real one (docs/sglang.md)"
        )

    stand_in.__name__ = stand_in.__qualname__ = name
    return stand_in


def sgl_kernel_module() -> types.ModuleType:
    """The stand-in ``sgl_kernel``: the names of :data:`SGL_KERNEL_NAMES`, each loud when called."""
    module = types.ModuleType(STANDIN_NAME, "wirebench stand-in for sgl_kernel (harness/sglang_hook/cpu_standins.py)")
    module.__wirebench_standin__ = True  # type: ignore[attr-defined]
    for name in SGL_KERNEL_NAMES:
        setattr(module, name, _loud(name))
    return module


def define_torchvision_schemas(package_dir: Path) -> bool:
    """Define torchvision's ``nms`` and ``qnms`` schemas when its own C extension does not load; True if done."""
    import torch

    for library in sorted(package_dir.glob("_C*.so")):
        try:
            torch.ops.load_library(str(library))
        except (OSError, RuntimeError):  # the CUDA build: its CUDA libraries are not here
            continue
    if hasattr(torch.ops.torchvision, "nms"):
        return False  # a torchvision whose ops loaded: nothing to stand in for
    fragment = torch.library.Library("torchvision", "FRAGMENT")
    for schema in TORCHVISION_SCHEMAS:
        fragment.define(schema)
    _keep_alive.append(fragment)  # a Library deregisters its definitions when collected
    return True


_keep_alive: list[Any] = []


class _StandInLoader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return sgl_kernel_module()

    def exec_module(self, module: types.ModuleType) -> None:
        return None


class StandInFinder(importlib.abc.MetaPathFinder):
    """Stands in for ``sgl_kernel`` when no real one is on the path; prepares torchvision's import."""

    def __init__(self) -> None:
        self.torchvision_done = False

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname == STANDIN_NAME:
            if importlib.machinery.PathFinder.find_spec(fullname) is not None:
                return None  # a real sgl_kernel wins
            return importlib.util.spec_from_loader(fullname, _StandInLoader())
        if fullname == "torchvision" and not self.torchvision_done:
            self.torchvision_done = True
            spec = importlib.machinery.PathFinder.find_spec(fullname)
            if spec is not None and spec.submodule_search_locations:
                define_torchvision_schemas(Path(next(iter(spec.submodule_search_locations))))
        return None


def install() -> None:
    """Put the finder first on ``sys.meta_path`` (once)."""
    if not any(isinstance(f, StandInFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, StandInFinder())
