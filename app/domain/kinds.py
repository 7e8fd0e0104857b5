"""The kinds of cluster object the guard reads.

``KINDS`` are required: the guard is not ready until each has been listed. ``KUBEVIRT`` (the KubeVirt CR)
is optional: when it cannot be read the rules that use it fail open, and it never holds readiness back.
"""

VMI, VMIM, POD, NODE = "vmi", "vmim", "pod", "node"
KINDS = (VMI, VMIM, POD, NODE)
KUBEVIRT = "kubevirt"
OPTIONAL_KINDS = (KUBEVIRT,)
DESCHEDULER = "kubedescheduler"  # read by report from a snapshot or a live list; serve follows it on its own
