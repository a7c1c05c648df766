"""What feeds a net: the data sources (digits, synthetic, .npz, CIFAR-10, image folders, Caffe's
LMDB and ImageData), datasets, read-ahead on a worker thread, and fitting a source to a net."""
