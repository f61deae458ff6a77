"""Exit codes: 0 clean, 1 problems found (or a diff to apply), 2 usage, configuration or internal error."""

EXIT_OK, EXIT_PROBLEMS, EXIT_ERROR = 0, 1, 2
