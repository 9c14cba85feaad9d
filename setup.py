"""Maps the architecture's top-level folders onto unique import names.

services/ -> preft_serve, kernels/ -> preft_kernels. Everything else lives in pyproject.toml.
"""

from setuptools import find_packages, setup

FOLDERS = {"preft_serve": "services", "preft_kernels": "kernels"}


def _packages() -> list[str]:
    found: list[str] = []
    for name, folder in FOLDERS.items():
        found.append(name)
        found.extend(f"{name}.{sub}" for sub in find_packages(folder))
    return found


setup(packages=_packages(), package_dir=FOLDERS, package_data={"preft_serve": ["py.typed"]})
