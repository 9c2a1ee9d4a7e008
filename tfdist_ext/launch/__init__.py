"""Starting workers: the `tfdist-run` launcher."""

from tfdist_ext.launch.launcher import Launcher, free_ports, tf_configs

__all__ = ["Launcher", "free_ports", "tf_configs"]
