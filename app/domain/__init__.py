"""The domain types every layer shares: records of VMIs, VMIMs, launcher pods and nodes
(and their projections from API objects), the kind names, the view policy reads, and
cache health. A leaf: it imports nothing from the rest of the application but the
timestamp helpers."""
