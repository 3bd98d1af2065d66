"""TVD and JSD between distributions (J&W 2019, sec. 4). Stub: filled in by the kernels work."""


def tvd(p, q, dim=-1):
    raise NotImplementedError


def jsd(p, q, dim=-1):
    raise NotImplementedError
