"""Starting workers: the `tfdist-run` launcher."""

from tfdist_ext.launch.addresses import free_ports, tf_configs
from tfdist_ext.launch.launcher import Launcher

__all__ = ["Launcher", "free_ports", "tf_configs"]
