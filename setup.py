"""The packages of the wheel are found, not listed: ``egraph_opt`` and the three top-level folders
(``rulesets``, ``extractors``, ``kernels``) that install as its subpackages, so that no top-level
import name can clash with another distribution. A new subpackage needs no line here."""
from setuptools import find_packages, setup

MAPPED = {"egraph_opt": "egraph_opt", "egraph_opt.rulesets": "rulesets",
          "egraph_opt.extractors": "extractors", "egraph_opt.kernels": "kernels"}

setup(packages=[f"{name}{'.' + sub if sub else ''}" for name, folder in MAPPED.items()
                for sub in ["", *find_packages(folder)]],
      package_dir=MAPPED)
