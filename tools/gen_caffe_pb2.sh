#!/bin/sh
# Regenerate superneuron/netfile/caffe/caffe_pb2.py from superneuron/netfile/caffe/caffe.proto.
# Needs grpcio-tools (pip install grpcio-tools), whose protoc must match the protobuf major
# version pinned in setup.cfg. Run from the repository root.
set -e
python -m grpc_tools.protoc -Isuperneuron/netfile/caffe --python_out=superneuron/netfile/caffe superneuron/netfile/caffe/caffe.proto
