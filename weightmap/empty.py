"""Building a model without memory for its weights, but with the buffers it computes.

``with torch.device("meta")`` puts *every* tensor a module makes on the meta
device, including the non-persistent buffers that no checkpoint holds (rotary
frequencies, position ids): after :func:`weightmap.map_weights` such a model
still cannot run. :func:`init_empty_weights` puts only the parameters on meta;
buffers are computed by the module's own ``__init__`` as usual.

How: while the context is active on a thread, ``torch.nn.Module.register_parameter``
(through which ``module.weight = Parameter(...)`` and every ``nn`` layer register
their parameters) registers a meta copy of each real parameter instead. Three
things make it keep what accelerate's ``init_empty_weights`` loses:

* a parameter already on meta is registered as it is, so a tie made in
  ``__init__`` (``self.head.weight = self.embed.weight``) stays one object;
* a real parameter registered twice (the same ``Parameter`` given to two
  modules) becomes the same meta parameter both times, so that tie stays too;
* the replacement is of the parameter's own class, with its ``requires_grad``
  and its Python attributes.

The patch is installed while at least one context is open and acts only on the
threads that opened one: a model built on another thread at the same time is
built as usual.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import torch
from torch.nn.parameter import UninitializedParameter
from torch.overrides import TorchFunctionMode
from torch.utils._device import _device_constructors
from torch.utils.weak import WeakIdKeyDictionary

__all__ = ["init_empty_weights"]

_Module = torch.nn.Module
_lock = threading.Lock()
_users = 0  # open contexts, all threads together: the patch is installed while this is above 0
_original_parameter = _Module.register_parameter
_original_buffer = _Module.register_buffer


class _ThreadState(threading.local):
    def __init__(self) -> None:
        self.stack: list[_Context] = []


_state = _ThreadState()


class _Context:
    """One open ``init_empty_weights`` block: what it moves, and the meta copies it made (for ties).

    ``stack`` is the opening thread's stack of blocks (the block removes itself from it, on
    whichever thread it ends); ``thread`` the opening thread.
    """

    def __init__(self, include_buffers: bool) -> None:
        self.include_buffers = include_buffers
        self.stack = _state.stack
        self.thread = threading.get_ident()
        # The real tensor -> its meta copy. Weak keys: a real parameter nobody else holds
        # (nn.Linear's ``torch.empty``) is freed at once, so building never holds a model's
        # worth of real memory.
        self.copies: WeakIdKeyDictionary = WeakIdKeyDictionary()

    def meta_parameter(self, param: torch.nn.Parameter) -> torch.nn.Parameter:
        if param.device.type == "meta" or isinstance(param, UninitializedParameter):
            return param  # on meta already, or a lazy module's parameter: it has no data yet
        copy = self.copies.get(param)
        if copy is None:
            data = param.detach().to("meta")
            # Parameter.__new__ wraps plain tensors with _make_subclass for any subclass, so a
            # subclass with its own constructor signature is copied without calling it.
            copy = torch.nn.Parameter.__new__(type(param), data, param.requires_grad)
            copy.__dict__.update(param.__dict__)
            self.copies[param] = copy
        return copy

    def meta_buffer(self, tensor: torch.Tensor) -> torch.Tensor:
        if tensor.device.type == "meta":
            return tensor
        copy = self.copies.get(tensor)
        if copy is None:
            copy = tensor.detach().to("meta").requires_grad_(tensor.requires_grad)
            self.copies[tensor] = copy
        return copy


def _current() -> _Context | None:
    return _state.stack[-1] if _state.stack else None


def _register_parameter(self: torch.nn.Module, name: str, param: torch.nn.Parameter | None) -> None:
    context = _current()
    if context is not None and param is not None:
        param = context.meta_parameter(param)
    _original_parameter(self, name, param)


def _register_buffer(self: torch.nn.Module, name: str, tensor: torch.Tensor | None, persistent: bool = True) -> None:
    context = _current()
    if context is not None and context.include_buffers and isinstance(tensor, torch.Tensor):
        tensor = context.meta_buffer(tensor)
    _original_buffer(self, name, tensor, persistent)


def _install() -> None:
    global _users
    with _lock:
        if _users == 0:
            _Module.register_parameter = _register_parameter  # type: ignore[method-assign]
            _Module.register_buffer = _register_buffer  # type: ignore[method-assign]
        _users += 1


def _uninstall() -> None:
    global _users
    with _lock:
        _users -= 1
        if _users == 0:
            # Put the originals back only where ours are still installed: a patch made over
            # ours since is left to its owner (ours does nothing with no context open).
            if _Module.register_parameter is _register_parameter:
                _Module.register_parameter = _original_parameter  # type: ignore[method-assign]
            if _Module.register_buffer is _register_buffer:
                _Module.register_buffer = _original_buffer  # type: ignore[method-assign]


@contextlib.contextmanager
def init_empty_weights(include_buffers: bool = False) -> Iterator[None]:
    """Build modules with their parameters on the meta device and their buffers real.

    Contract:

    * Every parameter registered on this thread inside the block (by ``nn`` layers,
      ``module.name = Parameter(...)``, ``register_parameter``) is on the meta
      device: no memory for weights, and nothing initialises them.
      :func:`weightmap.map_weights` then makes them views of a checkpoint.
    * Buffers are real and hold what the module's ``__init__`` computed (rotary
      frequencies, position ids, masks), so that once the persistent tensors are
      mapped the model runs. ``include_buffers=True`` puts buffers on meta too,
      and every tensor created in the block (as ``torch.device("meta")`` does;
      accelerate's meaning of the flag).
    * Ties stay ties: a parameter already on meta is registered as it is (so
      ``self.head.weight = self.embed.weight`` keeps one object), and one real
      parameter registered under several names becomes one meta parameter. The
      meta parameter keeps the class, ``requires_grad`` and attributes of the
      real one.
    * Parameters are still created real by the layers' own code and moved to meta
      as they are registered: building holds at most one real parameter at a
      time (``torch.empty`` allocates without touching the memory), and a
      ``reset_parameters`` that runs after registration costs nothing.
    * Only this thread is affected: ``torch.nn.Module.register_parameter`` and
      ``register_buffer`` are wrapped while any block is open, and the wrappers do
      nothing on threads without one. Blocks nest; the innermost decides: an
      ``include_buffers=False`` block inside an ``include_buffers=True`` one makes
      buffers and tensors real again (on the default device).
      A block may be closed on another thread than the one that opened it.
    * Lazy modules' parameters (``nn.LazyLinear``: ``UninitializedParameter``) have
      no data until the module first runs; they are registered as they are.
    * Tensors put straight into ``module._parameters`` (not through
      ``register_parameter``) are not seen, and stay real.

    Example::

        with init_empty_weights():
            model = MyModel()                 # parameters on meta, inv_freq computed
        map_weights(model, "model.safetensors", strict=True)
        model(tokens)                         # runs
    """
    context = _Context(include_buffers)
    _install()
    context.stack.append(context)
    mode = _MetaTensors() if include_buffers else None
    if mode is not None:
        mode.__enter__()
    try:
        yield
    finally:
        # Removed from the stack of the thread that opened it, even when another thread
        # closes it (a generator or a coroutine resumed elsewhere).
        for i in range(len(context.stack) - 1, -1, -1):
            if context.stack[i] is context:
                del context.stack[i]
                break
        _uninstall()
        # torch's mode stack is per thread: closed on another thread, the mode stays on the
        # opening thread's stack, where it does nothing once no include_buffers block is open.
        if mode is not None and threading.get_ident() == context.thread:
            mode.__exit__(None, None, None)


class _MetaTensors(TorchFunctionMode):
    """Creates tensors on meta (as ``torch.device("meta")`` does) while the innermost open block on
    this thread has ``include_buffers=True``; does nothing otherwise."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        context = _current()
        if context is not None and context.include_buffers and kwargs.get("device") is None \
                and func in _device_constructors():
            kwargs["device"] = "meta"
        return func(*args, **kwargs)
