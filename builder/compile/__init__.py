"""Compile stage: rendered sources to cubins and exported objects, in GPU-blind workers, cached
by content."""
