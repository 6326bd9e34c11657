"""Environment variables the tuner reads, named once for the CLI, the workers it starts and the engines
(which must not inherit them: they may carry database passwords)."""

# Defaults for --storage and --tracking-uri: URLs with passwords stay out of the command line (and `ps`).
STORAGE_ENV = "SPECDEC_TUNER_STORAGE"
TRACKING_ENV = "SPECDEC_TUNER_TRACKING_URI"
