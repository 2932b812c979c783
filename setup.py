"""Builds libtiershim.so with the system C compiler and ships it, with the
shared header, inside the tiering package."""
import shutil
from pathlib import Path

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

PLAN_CFLAGS = ["-O2", "-Wall", "-Wextra", "-fPIC"]
SHIM_CFLAGS = ["-O2", "-Wall", "-Wextra", "-Wno-nonnull-compare", "-fPIC", "-fvisibility=hidden",
               "-fno-delete-null-pointer-checks", "-U_FORTIFY_SOURCE", "-D_FORTIFY_SOURCE=0"]


class BuildShim(build_ext):
    """libtiershim.so and libtierplan.so are plain shared libraries, not
    Python extensions: keep their names free of the interpreter's suffix."""

    def get_ext_filename(self, fullname: str) -> str:
        return str(Path(*fullname.split("."))) + ".so"


class BuildPy(build_py):
    def run(self) -> None:
        super().run()
        shutil.copy("shim/tiering.h", Path(self.build_lib, "tiering", "tiering.h"))


setup(
    # every subpackage of tiering, and the shipped profiles as tiering.profiles
    packages=find_packages(include=["tiering", "tiering.*"]) + ["tiering.profiles"],
    package_dir={"tiering.profiles": "profiles"},
    ext_modules=[Extension("tiering.libtiershim", sources=["shim/tiershim.c", "shim/tiercopy.c", "shim/tierscan.c"],
                           depends=["shim/tiering.h"], extra_compile_args=SHIM_CFLAGS,
                           libraries=["dl"]),
                 # the planner's core (tiering/clairvoyant/plancore.c), reached through cffi, and
                 # the replay of torch's generator (torchrng.c), through ctypes
                 Extension("tiering.clairvoyant.libtierplan",
                           sources=["tiering/clairvoyant/plancore.c", "tiering/clairvoyant/torchrng.c"],
                           depends=["tiering/clairvoyant/plancore.h"], extra_compile_args=PLAN_CFLAGS)],
    cmdclass={"build_ext": BuildShim, "build_py": BuildPy},
)
