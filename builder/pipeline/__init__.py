"""The build as a whole: load, check, render, compile and package in order, sharded, merged and
checked for reproducibility."""
