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


# -- indices -> files (NOTE [learnt mapping]) -----------------------------------

_KNOWN = ("samples", "imgs", "files", "file_list", "paths", "image_paths")
_SAMPLE = 64             # items of an attribute looked at before it is taken as the mapping
_TAG_BITS = 24           # a tag is (space << 24) | (index + 1): 16.7 M indices per data set
_MAX_INDEX = (1 << _TAG_BITS) - 2
_MAX_FILES = 8           # files an index may name (image, mask, ...): the daemon keeps as many


class _NoMapping(Exception):
    """Why no attribute maps the data set (said in the summary)."""


def _looks_like_path(s):
    if isinstance(s, os.PathLike):
        return True
    if not isinstance(s, str) or not s or "\n" in s:
        return False
    ext = os.path.splitext(s)[1]
    return os.sep in s or (1 < len(ext) <= 8 and ext[1:].isalnum())


def _path_in(item):
    """The files an item names: itself, or the path fields of a tuple or the
    path values of a dict (an image and its mask), a tuple when several;
    None when none."""
    if _looks_like_path(item):
        return item
    if isinstance(item, dict):
        fields = list(item.values())
    elif isinstance(item, (list, tuple)):
        fields = list(item[:_MAX_FILES])
    else:
        return None
    found = [f for f in fields if _looks_like_path(f)][:_MAX_FILES]
    if len(found) > 1:
        return tuple(found)
    return found[0] if found else None


class _Files(tuple):
    """An index's files, found side by side in several attributes."""


def _fspath(p):
    return tuple(os.fspath(q) for q in p) if isinstance(p, tuple) else os.fspath(p)


def _side_by_side(found):
    """Attributes that each list files, index by index (images and masks):
    one mapping that names each index's files in the attributes' order."""
    labels = [label for label, _ in found]
    everys = [every for _, every in found]

    def every():
        for items in zip(*(e() for e in everys)):
            files = []
            for item in items:
                p = _path_in(item)
                if p is None:
                    yield None
                    break
                files.extend(p if isinstance(p, tuple) else (p,))
            else:
                yield _Files(files[:_MAX_FILES])
    return " + ".join(labels), every


def _is_series(v):
    return type(v).__name__ == "Series" and type(v).__module__.startswith("pandas")


def _is_frame(v):
    return type(v).__name__ == "DataFrame" and type(v).__module__.startswith("pandas")


def _columns(name, value, n):
    """(name, getter, all-items) of each index-aligned sequence in an attribute."""
    if _is_frame(value):
        if _len(value) == n:
            for col in list(value.columns)[:64]:
                series = value[col]
                if _is_series(series):
                    yield f"{name}[{col!r}]", series.iloc.__getitem__, series.tolist
        return
    if _is_series(value):
        if _len(value) == n:
            yield name, value.iloc.__getitem__, value.tolist
        return
    if isinstance(value, (list, tuple)) and len(value) == n:
        yield name, value.__getitem__, lambda: value
    elif type(value).__name__ == "ndarray" and getattr(value, "ndim", 0) == 1 and len(value) == n:
        yield name, value.__getitem__, value.tolist
    elif isinstance(value, dict) and len(value) == n and n and 0 in value and n - 1 in value:
        yield name, value.__getitem__, lambda: [value[i] for i in range(n)]


def _sample(n):
    step = max(1, n // _SAMPLE)
    return sorted(set(range(0, n, step)) | {n - 1}) if n > 0 else []


def _attribute_paths(ds, n):
    """(NAME, paths) of the one attribute whose items name a file each."""
    try:
        attrs = dict(vars(ds))
    except TypeError:
        attrs = {}
    for name in _KNOWN:    # also class attributes and properties under a known name
        if name not in attrs:
            try:
                attrs[name] = getattr(ds, name)
            except Exception:
                pass
    names = [a for a in _KNOWN if a in attrs] + [a for a in attrs if a not in _KNOWN]
    found = {}          # sampled paths -> (name, all-items)
    known = {}          # the same, of the attributes with a known name
    seen = set()
    for name in names:
        value = attrs[name]
        if id(value) in seen:
            continue
        seen.add(id(value))
        for label, get, every in _columns(name, value, n):
            try:
                sampled = tuple(_path_in(get(i)) for i in _sample(n))
            except Exception:
                continue
            if sampled and all(p is not None for p in sampled):
                key = tuple(_fspath(p) for p in sampled)
                found.setdefault(key, (label, every))
                if name in _KNOWN:
                    known.setdefault(key, (label, every))
    if len(known) == 1:
        found = known   # a list under a known name wins (FileDataset's files beside its relative paths)
    if not found:
        raise _NoMapping(f"no attribute of {type(ds).__name__} lists one file per index")
    if len(found) > 1:   # side by side, if their files differ (else the daemon's check refuses them)
        label, every = _side_by_side(list(found.values())[:_MAX_FILES])
    else:
        label, every = next(iter(found.values()))
    paths = []
    for item in every():
        p = tuple(item) if isinstance(item, _Files) else _path_in(item)
        if p is None:
            raise _NoMapping(f"attribute {label} of {type(ds).__name__}: an item names no file")
        paths.append([os.path.abspath(q) for q in _fspath(p)] if isinstance(p, tuple)
                     else os.path.abspath(os.fspath(p)))
    return label, paths


def _paths_of(ds):
    """(how, paths): the file each index of the data set reads, read from its
    attributes, or raises _NoMapping."""
    import torch.utils.data as tud
    n = _len(ds)
    if n <= 0:
        raise _NoMapping(f"{type(ds).__name__} has no length")
    if isinstance(ds, tud.Subset):
        how, inner = _paths_of(ds.dataset)
        return f"{how} (Subset)", [inner[i] for i in ds.indices]
    if isinstance(ds, tud.ConcatDataset):
        hows, out = [], []
        for d in ds.datasets:
            how, inner = _paths_of(d)
            hows.append(how)
            out.extend(inner)
        return " + ".join(dict.fromkeys(hows)) + " (ConcatDataset)", out
    return _attribute_paths(ds, n)


def _space(ds, n):
    """The tag space of a data set: the same in the main process and in
    every worker (fork or spawn), from what a copy of it keeps: its class,
    its length and its short string attributes (a root directory, a split
    name), and those of the data set a Subset wraps.  Two data sets of one
    class and length over other directories get different spaces."""
    import zlib

    import torch.utils.data as tud
    parts = [str(n)]
    for _ in range(8):
        parts.append(f"{type(ds).__module__}.{type(ds).__qualname__}")
        try:
            attrs = vars(ds)
        except TypeError:
            attrs = {}
        for name in sorted(a for a in attrs if isinstance(a, str)):
            value = attrs[name]
            if isinstance(value, os.PathLike):
                value = os.fspath(value)
            if isinstance(value, str) and len(value) <= 4096:
                parts.append(f"{name}={value}")
        if type(ds) is not tud.Subset:
            break
        ds = ds.dataset
    return zlib.crc32("\0".join(parts).encode("utf-8", "surrogateescape")) % 255 + 1


_set_tag = None
_tag_checked = False


def _tagger():
    """tiering_set_tag of the preloaded shim, or None."""
    global _set_tag, _tag_checked
    if not _tag_checked:
        _tag_checked = True
        try:
            import ctypes
            fn = ctypes.CDLL(None).tiering_set_tag
            fn.argtypes = [ctypes.c_uint32]
            fn.restype = None
            _set_tag = fn
        except (OSError, AttributeError):
            _set_tag = None
    return _set_tag


def _by_index(ds):
    """True when fetching a batch is dataset[i] for each i (no batch fetch of
    the user's own: torch's Subset passes each index through)."""
    import torch.utils.data as tud
    while type(ds) is tud.Subset:
        ds = ds.dataset
    return not callable(getattr(ds, "__getitems__", None))


def _learnable(ds):
    """(space, length) when the opens of dataset[i] can be tagged, else the reason."""
    n = _len(ds)
    if n <= 0:
        return None, f"{type(ds).__name__} has no length"
    if n > _MAX_INDEX:
        return None, f"{type(ds).__name__} has more than {_MAX_INDEX:,} items"
    if not _by_index(ds):
        return None, f"{type(ds).__name__} fetches whole batches (__getitems__)"
    if _tagger() is None:
        return None, "the shim's tiering_set_tag is not loaded in COMMAND"
    return {"space": _space(ds, n), "length": n}, None


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


def _is_pls(s):
    """Whether s is tiering's PartialLocalShuffleSampler itself (not a
    subclass): its order is a function of its fields and set_epoch's epoch,
    with no RNG of the training's (NOTE [partial local shuffling])."""
    return type(s).__module__ == "tiering.samplers" and type(s).__qualname__ == "PartialLocalShuffleSampler"


def _own_samplers(s):
    """True when s and the samplers inside it are torch's own classes (or
    tiering's PartialLocalShuffleSampler): those can be run on a copy without
    touching the real one (a custom sampler may keep RNGs or state the copy
    would share, or never end)."""
    while s is not None:
        if not (type(s).__module__.startswith("torch.utils.data") or _is_pls(s)):
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
        if isinstance(inner, tud.distributed.DistributedSampler) or _is_pls(inner):
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


def _mapping_message(ds):
    """What the daemon is told of the data set's files: the paths read from
    an attribute (how) and, whenever the opens can be tagged, the tag space
    it learns the mapping in when the paths do not check out (NOTE [learnt
    mapping])."""
    msg = {"paths": None, "how": None, "why": None}
    if _iterable(ds):
        return dict(msg, learn=None, why=f"{type(ds).__name__} is an IterableDataset: it yields its samples in "
                    "an order of its own, with no indices to announce")
    try:
        msg["how"], msg["paths"] = _paths_of(ds)
    except _NoMapping as e:
        msg["why"] = str(e)
    except Exception as e:   # a user attribute that fails when read
        msg["why"] = f"reading the attributes of {type(ds).__name__} failed: {e!r}"
    learn, why = _learnable(ds)
    msg["learn"] = learn
    if learn is None:
        msg["why"] = f"{msg['why']}; cannot learn it: {why}" if msg["why"] else f"cannot learn it: {why}"
    return msg


def _iterable(ds):
    """Whether ds is a torch IterableDataset (its DataLoader has no sampler of indices)."""
    import torch.utils.data as tud
    return isinstance(ds, tud.IterableDataset)


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
            _write("dataset", dict(_mapping_message(loader.dataset), loader=key))
            _datasets_sent.add(key)
        if _iterable(loader.dataset):
            _unmappable.add(key)   # no order to announce, this epoch or later
            return
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


def _fetch_tag(fetcher):
    """The tag space (shifted) the fetcher tags its indices with, 0: none."""
    ds = fetcher.dataset
    learn, _ = _learnable(ds)
    return (learn["space"] << _TAG_BITS, learn["length"]) if learn else (0, 0)


def _patch_fetch(fetch_module):
    """Wraps each dataset[i] of a map-style fetch in tiering_set_tag(tag of i)
    ... tiering_set_tag(0): the shim's events then say which index opened
    which file (NOTE [learnt mapping]).  Two calls of a C function per
    sample; the first fetch checks the data set once."""
    cls = fetch_module._MapDatasetFetcher
    if getattr(cls, "_tiering_patched", False):
        return
    orig_fetch = cls.fetch

    def fetch(self, possibly_batched_index):
        tagging = self.__dict__.get("_tiering_tag")
        if tagging is None:
            try:
                tagging = _fetch_tag(self)
            except Exception as e:
                _log(f"tagging off: {e!r}")
                tagging = (0, 0)
            self._tiering_tag = tagging
        space, n = tagging
        set_tag = _set_tag
        if not space or set_tag is None:
            return orig_fetch(self, possibly_batched_index)
        ds = self.dataset
        if self.auto_collation:
            data = []
            for idx in possibly_batched_index:
                set_tag(space | (idx + 1) if type(idx) is int and 0 <= idx < n else 0)
                try:
                    data.append(ds[idx])
                finally:
                    set_tag(0)
        else:
            idx = possibly_batched_index
            set_tag(space | (idx + 1) if type(idx) is int and 0 <= idx < n else 0)
            try:
                data = ds[idx]
            finally:
                set_tag(0)
        return self.collate_fn(data)

    cls.fetch = fetch
    cls._tiering_patched = True


def _patch(dataloader_module):
    try:
        import torch.utils.data._utils.fetch as fetch_module
        _patch_fetch(fetch_module)
    except Exception as e:
        _log(f"fetch patch failed: {e!r}")
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
