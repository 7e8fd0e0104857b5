"""The actor: what has no binary in the end-to-end runs against real KubeVirt (virt-api and virt-controller,
``tests/e2e/kubevirt.py``): the scheduler's binding, kubelet and virt-handler (``node.py``), for the outcome run with
the scenario's hardware (``physics.py``: where a target goes, how long a copy takes, how it ends), an observer that
records the VMIMs KubeVirt made (``record.py``) and the scenario's load served to Prometheus (``load.py``).
``python -m tests.e2e.actor --help`` runs it for the outcome run.
"""
