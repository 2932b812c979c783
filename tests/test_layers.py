"""The package's layers (docs/design.md, "The parts"; .importlinter): no
module imports from a layer above its own, and no package's modules import
each other in a cycle, but for the imports .importlinter lists as still
going up.  Checked with import-linter on the modules' import statements,
the ones inside functions too."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

CONFIG = Path(__file__).resolve().parent.parent / ".importlinter"


def test_the_layers_and_no_cycles_hold():
    # in a process of its own: import-linter sets up logging its own way, which later tests' caplog would miss
    r = subprocess.run([sys.executable, "-c", "import sys; from importlinter import cli; "
                        "sys.exit(cli.lint_imports(config_filename=sys.argv[1], no_cache=True, no_logo=True))",
                        str(CONFIG)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "2 kept, 0 broken" in r.stdout


def test_every_listed_exception_is_an_import_that_exists():
    """An import listed as a known debt that no longer exists is taken off
    the list (the list is what is left to do, not a blanket waiver)."""
    import grimp
    graph = grimp.build_graph("tiering")
    listed = {line.strip() for line in CONFIG.read_text().splitlines() if "->" in line and not line.startswith(";")}
    assert listed
    for entry in listed:
        importer, imported = (s.strip() for s in entry.split("->"))
        assert graph.direct_import_exists(importer=importer, imported=imported), f"{entry}: no such import now"
