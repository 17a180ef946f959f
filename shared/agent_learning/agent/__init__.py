"""What an agent imports: read the policy (client), record an episode (capture)."""
