"""The one build setting pyproject.toml cannot say: the wheel carries the top-level conf/ as the
package directory jagg_lab/conf, so an install outside the checkout finds the configs
(jagg_lab.CONF_DIR). Everything else is in pyproject.toml."""
from setuptools import find_packages, setup

setup(
    # hydra_plugins.jagg_lab_launcher: the local sweep launcher (Hydra finds launchers in that namespace only)
    packages=[*find_packages(include=["jagg_lab*"]), "jagg_lab.conf", "hydra_plugins.jagg_lab_launcher"],
    package_dir={"jagg_lab.conf": "conf"},
    package_data={"jagg_lab": ["assets/*", "assets/heldout/*.json"], "jagg_lab.conf": ["**/*.yaml"]},
)
