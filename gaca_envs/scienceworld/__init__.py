"""ScienceWorld (Wang et al., 2022) on its own engine under the gaca text contract."""
