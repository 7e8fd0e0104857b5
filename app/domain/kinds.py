"""The four kinds of cluster object the guard reads."""

VMI, VMIM, POD, NODE = "vmi", "vmim", "pod", "node"
KINDS = (VMI, VMIM, POD, NODE)
