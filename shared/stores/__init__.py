"""The stores: one owner per stored collection, with named operations over typed documents."""
