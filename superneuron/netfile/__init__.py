"""The net file's language: YAML read with every value's position, templates, repeats and safe
``${}`` expressions, --set, Caffe's include/exclude rules, the checked NetSpec; and Caffe's own
formats (caffe/: .prototxt nets and solvers, .caffemodel weights)."""
