"""``python -m agent_learning.cli``: the ``agent-learn`` command."""

from . import main

if __name__ == "__main__":  # pragma: no cover
    main()
