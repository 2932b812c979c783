"""tiering's zero-code order hook, loaded by Python at start-up through
PYTHONPATH when tier-run runs a Python command.

It patches torch's DataLoader iterator (only once torch.utils.data is
imported; it never imports torch itself) so that, when an epoch of a
DataLoader asks its sampler for the first index, the hook runs a copy of the
sampler (with copies of its torch generators, and the global RNGs of torch,
random and numpy saved and put back) to learn the epoch's whole order, and
publishes it to the tiering daemon.  The real sampler then runs as it would
without the hook, so every random number generator advances exactly as it
would without it, even when the training leaves an epoch early.

Standard library only: the interpreter that runs the command may not have
the tiering package installed.  Any failure here is swallowed: the hook can
make prefetching worse, never the training.  Then it chains to the
sitecustomize that it shadows, if there is one.
"""
import copy
import importlib.abc
import importlib.machinery
import importlib.util
import itertools
import json
import os
import sys

_ORDER_DIR = os.environ.get("TIERING_ORDER_DIR")
_DEBUG = bool(os.environ.get("TIERING_DEBUG"))
_HERE = os.path.dirname(os.path.abspath(__file__))
_seq = itertools.count()
_loader_ids: dict = {}   # id(DataLoader) -> (key, epochs seen)
_loader_count = itertools.count()
_datasets_sent: set = set()
_unmappable: set = set()


def _log(msg):
    if _DEBUG:
        sys.stderr.write(f"tiering hook[{os.getpid()}]: {msg}\n")


def _write(kind, payload):
    """One message = one JSON file in the order directory, written atomically."""
    name = f"{os.getpid()}-{next(_seq):08d}-{kind}"
    tmp = os.path.join(_ORDER_DIR, f".{name}.tmp")
    try:
        with open(tmp, "w") as f:
            json.dump(dict(payload, kind=kind, pid=os.getpid(), rank=_rank()), f)
        os.rename(tmp, os.path.join(_ORDER_DIR, name + ".json"))
    except OSError:
        try:
            os.unlink(tmp)   # e.g. /dev/shm full: leave nothing behind
        except OSError:
            pass
        raise


def _rank():
    for var in ("RANK", "SLURM_PROCID"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 0


# -- indices -> files ------------------------------------------------------

def _paths_of(ds):
    """The file each index of the data set reads, or None when unknown."""
    import torch.utils.data as tud
    if isinstance(ds, tud.Subset):
        inner = _paths_of(ds.dataset)
        return None if inner is None else [inner[i] for i in ds.indices]
    if isinstance(ds, tud.ConcatDataset):
        out = []
        for d in ds.datasets:
            inner = _paths_of(d)
            if inner is None:
                return None
            out.extend(inner)
        return out
    for attr in ("samples", "imgs", "files", "file_list", "paths", "image_paths"):
        items = getattr(ds, attr, None)
        if isinstance(items, (list, tuple)) and len(items) == _len(ds):
            paths = [it[0] if isinstance(it, (list, tuple)) and it else it for it in items]
            if all(isinstance(p, (str, os.PathLike)) for p in paths[:100]):
                return [os.path.abspath(os.fspath(p)) for p in paths]
    return None


def _len(ds):
    try:
        return len(ds)
    except TypeError:
        return -1


class _TooLong(Exception):
    pass


def _flatten(items, limit=None):
    out = []
    for it in items:
        if isinstance(it, (list, tuple)):
            out.extend(int(i) for i in it)
        else:
            out.append(int(it))
        if limit is not None and len(out) > limit:
            raise _TooLong()
    return out


def _own_samplers(s):
    """True when s and the samplers inside it are torch's own classes: those
    can be run on a copy without touching the real one (a custom sampler may
    keep RNGs or state the copy would share, or never end)."""
    while s is not None:
        if not type(s).__module__.startswith("torch.utils.data"):
            return False
        s = getattr(s, "sampler", None)
    return True


# -- the order, computed on copies so that no RNG of the training moves ---------

def _clone_generator(g, clones):
    import torch
    if id(g) not in clones:
        c = torch.Generator(device=g.device)
        c.set_state(g.get_state())
        clones[id(g)] = c
    return clones[id(g)]


def _copy_sampler(s, clones):
    """A shallow copy whose torch generators (and nested samplers) are copies."""
    import torch
    import torch.utils.data as tud
    c = copy.copy(s)
    for k, v in list(vars(s).items()):
        if isinstance(v, torch.Generator):
            setattr(c, k, _clone_generator(v, clones))
        elif isinstance(v, tud.Sampler):
            setattr(c, k, _copy_sampler(v, clones))
    return c


class _SavedRNG:
    """Saves the global RNGs (torch CPU, random, numpy) and puts them back."""

    def __enter__(self):
        import random

        import torch
        self.torch = torch.get_rng_state()
        self.random = random.getstate()
        np = sys.modules.get("numpy")
        self.numpy = np.random.get_state() if np is not None else None
        return self

    def touched(self):
        import torch
        return not torch.equal(torch.get_rng_state(), self.torch)

    def __exit__(self, *exc):
        import random

        import torch
        torch.set_rng_state(self.torch)
        random.setstate(self.random)
        np = sys.modules.get("numpy")
        if self.numpy is not None and np is not None:
            np.random.set_state(self.numpy)
        return False


def _orders(loader, index_sampler):
    """This epoch's indices and, when it can be known, the next epoch's."""
    import torch
    import torch.utils.data as tud
    clones = {}
    limit = 4 * max(_len(loader.dataset), 0) + 1024   # an epoch is not endless
    with _SavedRNG() as saved:
        items = _flatten(_copy_sampler(index_sampler, clones), limit)
        global_rng = saved.touched()
    if global_rng:
        return items, None   # the next epoch depends on the global RNG at that time
    with _SavedRNG():
        if loader.generator is not None and not loader.persistent_workers:
            # a new iterator first draws its workers' base seed from the loader's generator
            torch.empty((), dtype=torch.int64).random_(generator=_clone_generator(loader.generator, clones))
        nxt_sampler = _copy_sampler(index_sampler, clones)
        inner = getattr(nxt_sampler, "sampler", nxt_sampler)
        if isinstance(inner, tud.distributed.DistributedSampler):
            inner.set_epoch(inner.epoch + 1)   # what a training loop calls before the next epoch
        nxt = _flatten(nxt_sampler, limit)
    return items, nxt


# -- the patch ---------------------------------------------------------------

class _Announcing:
    """Stands in for the iterator over the sampler: at the first index asked
    for, it announces the epoch (computed on copies), then passes the real
    iterator's items through untouched."""

    def __init__(self, it, announce):
        self._it = it
        self._announce = announce

    def __iter__(self):
        return self

    def __next__(self):
        if self._announce is not None:
            announce, self._announce = self._announce, None
            try:
                announce()
            except Exception as e:  # never break the training
                _log(f"publishing failed: {e!r}")
        return next(self._it)


def _publisher(loader, index_sampler):
    key, seen = _loader_ids.get(id(loader), (None, 0))
    if key is None:
        key = next(_loader_count)
    epoch = seen
    _loader_ids[id(loader)] = (key, seen + 1)

    def announce():
        if not os.path.isdir(_ORDER_DIR or "") or key in _unmappable:
            return
        if key not in _datasets_sent:
            paths = _paths_of(loader.dataset)
            if paths is None:
                _write("error", {"loader": key, "message":
                                 f"cannot map the data set {type(loader.dataset).__name__} to files "
                                 "(it has no samples/imgs/files list); give the order with "
                                 "--sampler/--order-file, or prefetching follows first touch"})
                _unmappable.add(key)
                return
            _write("dataset", {"loader": key, "paths": paths})
            _datasets_sent.add(key)
        if not _own_samplers(index_sampler):
            _write("error", {"loader": key, "message":
                             f"the sampler {type(getattr(index_sampler, 'sampler', index_sampler)).__name__} is "
                             "not one of torch's: the hook does not run it twice; give the order with "
                             "--order-file, or prefetching follows first touch"})
            _unmappable.add(key)
            return
        try:
            items, nxt = _orders(loader, index_sampler)
        except _TooLong:
            _write("error", {"loader": key, "message": "the sampler yields more than 4x the data set per "
                             "epoch: not announced; prefetching follows first touch"})
            _unmappable.add(key)
            return
        _write("epoch", {"loader": key, "epoch": epoch, "indices": items, "next": nxt})

    return announce


def _patch(dataloader_module):
    base = dataloader_module._BaseDataLoaderIter
    if getattr(base, "_tiering_patched", False):
        return
    orig_init, orig_reset = base.__init__, base._reset

    def __init__(self, loader, *args, **kwargs):
        orig_init(self, loader, *args, **kwargs)
        try:
            self._sampler_iter = _Announcing(self._sampler_iter, _publisher(loader, self._index_sampler))
        except Exception as e:
            _log(f"patch failed: {e!r}")

    def _reset(self, loader, *args, **kwargs):
        orig_reset(self, loader, *args, **kwargs)
        try:
            # the multi-process iterator resets once in __init__ (same epoch);
            # persistent workers reset at every later epoch
            if isinstance(self._sampler_iter, _Announcing):
                return
            first = getattr(self, "_tiering_reset_seen", False) is False
            self._tiering_reset_seen = True
            if first:
                # __init__ already counted this epoch: publish under the same number
                key, seen = _loader_ids.get(id(loader), (None, 1))
                _loader_ids[id(loader)] = (key, seen - 1)
            self._sampler_iter = _Announcing(self._sampler_iter, _publisher(loader, self._index_sampler))
        except Exception as e:
            _log(f"patch failed: {e!r}")

    base.__init__ = __init__
    base._reset = _reset
    base._tiering_patched = True
    _log("DataLoader patched")


class _Finder(importlib.abc.MetaPathFinder):
    """Patches torch.utils.data.dataloader right after it is imported."""

    def find_spec(self, name, path, target=None):
        if name != "torch.utils.data.dataloader":
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                orig_exec = spec.loader.exec_module

                def exec_module(module, _orig=orig_exec):
                    _orig(module)
                    try:
                        _patch(module)
                    except Exception as e:
                        _log(f"patch failed: {e!r}")

                spec.loader.exec_module = exec_module
                return spec
        return None


def _chain():
    """Runs the sitecustomize this one shadows, if any."""
    others = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", others)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


def _hello():
    """Tells tier-run that the hook runs in COMMAND (a file "hello" made by
    the first interpreter that loads it, before any line of the training
    script runs): without it by COMMAND's first data-set open, tier-run says
    that the hook did not start (python -I, -E or -S; PYTHONPATH replaced)."""
    try:
        with open(os.path.join(_ORDER_DIR, "hello"), "x") as f:
            f.write(f"{os.getpid()} {sys.executable}\n")
    except FileExistsError:
        pass               # another process of COMMAND said it already
    except OSError as e:   # an order directory COMMAND cannot write: tier-run says so
        _log(f"hello failed: {e!r}")


if _ORDER_DIR:
    _hello()
    if "torch.utils.data.dataloader" in sys.modules:
        _patch(sys.modules["torch.utils.data.dataloader"])
    else:
        sys.meta_path.insert(0, _Finder())
try:
    _chain()
except Exception as e:
    _log(f"chained sitecustomize failed: {e!r}")
