"""What dumps look like: grouping, folding, text, JSON and HTML renderers, the demo program."""
