"""Package stage: kernel objects linked into one library, the manifest, the bundle directory
and its wheel."""
