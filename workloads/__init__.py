"""MODAK's reference training workloads (MNIST-CNN, ResNet) for PyTorch and Keras.

Run ``python3 workloads/train.py --help``.  Every run prints its figures of merit as
one JSON line starting with ``{"modak": "fom"``; a run that prints none has failed.
This package needs numpy and the framework only (no MODAK install): it is copied
into the job's work directory or into an image.
"""
