"""The small core of agentik: protocol types, turn engine, persistence, plugin manager."""
