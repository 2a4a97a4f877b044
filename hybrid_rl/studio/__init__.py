"""A config studio in the browser (issue #23): the form, its checks and its output, derived from the config."""
