"""Files `ddtree-ops` writes for the user (the annotated example project file)."""
