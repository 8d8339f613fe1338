"""The learner's input pipeline: from a trajectory transport to `Batch`es on the mesh
(grain datasets, staleness and problem filters, padding, packing)."""
