"""Cluster state: slim records of VMIs, VMIMs, virt-launcher pods and nodes, and the stores that index them."""
