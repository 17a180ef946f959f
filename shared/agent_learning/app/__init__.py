"""The composition root: settings, wiring, the Functions handlers, the embedded runner."""
