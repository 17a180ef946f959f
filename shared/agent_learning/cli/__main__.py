"""``python -m agent_learning.cli``: the ``agent-learn`` command."""

from agent_learning.cli import main

if __name__ == "__main__":  # pragma: no cover
    main()
