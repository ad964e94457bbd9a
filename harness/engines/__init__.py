"""What building an engine does with a partition's weights: the partition, the copy backends and the compiler."""
