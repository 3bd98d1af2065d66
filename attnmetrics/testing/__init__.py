"""What the tests and benchmarks check the library against (as captum's ``testing``): the
plain-loop references of every procedure, each following its paper's description step by step
(:mod:`attnmetrics.testing.reference`). Not the library's API: slow by design."""
