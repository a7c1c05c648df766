"""Caffe's own files: ``.prototxt`` nets and solvers read into our specs (:mod:`.prototxt`),
parsed by Google's ``protobuf`` against our schema of Caffe's messages (``caffe.proto``,
shipped with its generated ``caffe_pb2``)."""
