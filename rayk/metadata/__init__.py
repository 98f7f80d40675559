"""Cluster metadata as the Controller keeps it: typed, versioned records, the log they
are appended to, and snapshots of the image they build."""
