"""sn-make-lmdb: write a Caffe LMDB of ``Datum`` records from an ``.npz`` or an image folder, as
Caffe's ``convert_imageset`` does (:mod:`superneuron.data.make_lmdb` writes it).

    sn-make-lmdb digits.npz digits_train_lmdb --split train
    sn-make-lmdb photos/ photos_lmdb --encoded          # JPEG/PNG bytes kept as they are
"""

import argparse
import os
import sys

from ..data.make_lmdb import folder_records, npz_records, write_lmdb
from .common import run_cli


def build_parser():
    p = argparse.ArgumentParser(prog="sn-make-lmdb", description="Write a Caffe LMDB from an .npz or an image folder.")
    p.add_argument("source", help="an .npz (x, y and optionally x_test, y_test) or an image folder")
    p.add_argument("dest", help="the LMDB folder to create")
    p.add_argument("--split", choices=("train", "test"), default="train", help=".npz: which arrays (default train)")
    p.add_argument("--encoded", action="store_true", help="image folder: keep the files' bytes (encoded Datums)")
    return p


def main(argv=None):
    return run_cli(build_parser(), run, argv)


def run(args):
    if os.path.isdir(args.source):
        records = folder_records(args.source, args.encoded)
    else:
        records = npz_records(args.source, args.split)
    print(f"wrote {args.dest}: {write_lmdb(args.dest, records)} records")
    return 0


if __name__ == "__main__":
    sys.exit(main())
