"""Command groups of the `polyspec` command line that drive the data layer (ngram, suffix,
assets): they resolve names at the edge, so the packages they drive never import upward."""
