"""The catalog of the data roots: what files there are (scan, cache), how
paths map onto roots (roots) and which file sample i of the training data set
reads (layout)."""
from __future__ import annotations

from .cache import PendingSave, default_cache_dir, drop_cache, save_in_child, wait_writer
from .layout import IMG_EXTENSIONS, LAYOUTS, Layout, dataset_ids, dataset_order, dataset_samples
from .model import Catalog, CatalogDir, CatalogError, CatalogFile, DirAlias, FileTable, ReleasedColumn, ScanError
from .roots import PathIndex, RootMap
from .scan import ScanCallback, ScanProgress, normalise_roots, scan

__all__ = [
    "IMG_EXTENSIONS", "LAYOUTS", "Catalog", "CatalogDir", "CatalogError", "CatalogFile", "DirAlias", "Layout",
    "PathIndex", "ReleasedColumn", "RootMap", "ScanCallback", "ScanError", "ScanProgress",
    "FileTable", "dataset_ids", "dataset_order", "dataset_samples", "default_cache_dir", "drop_cache",
    "normalise_roots", "scan", "PendingSave", "save_in_child", "wait_writer",
]
