"""Caffe's data layers in a prototxt translated: LMDB and image lists read as ours, or synthetic stand-ins."""

import os

import numpy as np

from . import caffe_pb2

BOXES = 4  # synthetic boxes per image for an AnnotatedData layer


def f32(value):
    """A float field's value as written: the shortest decimal that is the same float32."""
    return float(str(np.float32(value)))


class DataLayers:
    """The data-layer part of prototxt.py's translator: it reads the translator's ``data``,
    ``shape`` and ``all`` (every layer of the net, with its type) and records through its
    ``problem``."""

    def data_layer(self, lp, lpos, item, ltype):
        """A Caffe Data or ImageData layer: synthetic data of its shape with ``data=synthetic``."""
        name = item.get("name")
        params = lp.image_data_param if ltype == "ImageData" else lp.data_param
        ppos = lpos.child("image_data_param" if ltype == "ImageData" else "data_param")
        tp = lp.transform_param
        if self.data is None and ltype == "AnnotatedData":
            self.problem(ppos.at("source") if params.source else lpos.mark, name, ltype,
                         f"annotated LMDB '{params.source}' is not read here (its boxes); plan and train "
                         "with --data synthetic (images with boxes)")
            return None
        if self.data is None:
            return self.lmdb_layer(lp, lpos, item, ltype, params, ppos, tp)
        crop = tp.crop_size or params.crop_size
        resize = tp.resize_param
        if ltype == "AnnotatedData" and not crop and resize.height and resize.height == resize.width:
            crop = resize.height  # SSD's files warp every image to the net's size
        if self.shape is not None:
            channels, size = self.shape[0], self.shape[1]
            if self.shape[1] != self.shape[2]:
                self.problem(lpos.mark, name, ltype, "synthetic data is square: give CxSxS")
        else:
            channels = 1 if tp.force_gray else len(tp.mean_value) if len(tp.mean_value) > 1 else None
            if ltype == "ImageData" and not params.is_color:
                channels = 1
            if ltype == "ImageData" and params.new_height and params.new_height == params.new_width:
                size = crop or params.new_height
            else:
                size = crop
            if channels is None and size:
                channels = 3  # colour images, as Caffe decodes them unless told otherwise
            if not size:
                self.problem(lpos.mark, name, ltype, "the sample shape is not written (no crop_size): "
                             "give it as --data synthetic:CxHxW, such as synthetic:1x28x28")
                return None
        item["type"] = "Data"
        values = [("source", "synthetic"), ("batch_size", params.batch_size or 1),
                  ("channels", channels), ("size", size), ("classes", self.classes(lp))]
        if ltype == "AnnotatedData" and len(lp.top) > 1:
            values.append(("boxes", BOXES))
        for key, value in values:
            item[key] = value
            item.keymarks[key] = item.valmarks[key] = ppos.at("batch_size") if key == "batch_size" else lpos.mark
        return item

    def lmdb_layer(self, lp, lpos, item, ltype, params, ppos, tp):
        """A Data layer reading its LMDB, or an ImageData layer its list: our Data layer with
        Caffe's transform, ``(x - mean) * scale`` written as our ``x * scale - mean * scale``;
        the TEST layer's source becomes the TRAIN layer's ``test_source``."""
        name = item.get("name")
        if ltype == "Data" and params.backend != caffe_pb2.DataParameter.LMDB:
            self.problem(ppos.at("backend"), name, ltype,
                         f"backend {caffe_pb2.DataParameter.DB.Name(params.backend)} is not read here (LMDB "
                         "only; convert the data with sn-make-lmdb), or plan and train with --data synthetic")
            return None
        if tp.force_color or tp.force_gray:
            self.problem(lpos.child("transform_param").mark, name, ltype, "force_color/force_gray are not supported")
            return None
        old = [f for f in ("scale", "mean_file", "crop_size", "mirror") if params.HasField(f)]
        if old:  # Caffe's deprecated copies of transform_param's fields
            self.problem(ppos.at(old[0]), name, ltype, f"'{old[0]}' belongs in transform_param")
            return None
        exists = os.path.isdir(params.source) if ltype == "Data" else os.path.isfile(params.source)
        if not exists:
            what = "LMDB" if ltype == "Data" else "image list"
            self.problem(ppos.at("source"), name, ltype, f"{what} '{params.source}' not found; make one with "
                         "sn-make-lmdb, or plan and train with --data synthetic (or synthetic:CxHxW)")
            return None
        scale = f32(tp.scale) if tp.HasField("scale") else 1.0
        values = {"source": params.source, "batch_size": params.batch_size or 1, "scale": scale,
                  "crop": int(tp.crop_size), "mirror": bool(tp.mirror), "shuffle": False}  # Caffe reads in order
        if ltype == "ImageData":
            values.update(shuffle=bool(params.shuffle), root_folder=params.root_folder,
                          new_height=int(params.new_height), new_width=int(params.new_width),
                          is_color=bool(params.is_color))
        if tp.mean_value:
            values["mean"] = [f32(m) * scale for m in tp.mean_value]
        if tp.mean_file:
            values["mean_file"] = tp.mean_file
        phases = {r.phase for r in lp.include}
        if caffe_pb2.TRAIN in phases:
            for other_type, other in self.all:
                if (other_type == ltype and other is not lp and list(other.top) == list(lp.top)
                        and caffe_pb2.TEST in {r.phase for r in other.include}):
                    values["test_source"] = (other.data_param if ltype == "Data" else other.image_data_param).source
        item["type"] = "Data"
        for key, value in values.items():
            item[key] = value
            item.keymarks[key] = item.valmarks[key] = lpos.mark
        return item

    def classes(self, data_lp):
        """The classes a label top takes: the num_output of the layer that feeds the loss."""
        if len(data_lp.top) < 2:
            return 10
        label = data_lp.top[1]
        for ltype, lp in self.all:
            if ltype == "MultiBoxLoss" and label in lp.bottom and lp.multibox_loss_param.num_classes:
                return int(lp.multibox_loss_param.num_classes)
            if ltype == "SoftmaxWithLoss" and len(lp.bottom) == 2 and lp.bottom[1] == label:
                scores = lp.bottom[0]
                for otype, other in self.all:
                    if scores in other.top and otype in ("InnerProduct", "Convolution"):
                        param = other.inner_product_param if otype == "InnerProduct" else other.convolution_param
                        if param.num_output:
                            return int(param.num_output)
        return 10
