"""Training data: three-task SFT examples built from chains (`examples`), and the examples dataset on
disk, built once, resumably, and tokenized once for the trainer (`dataset`)."""
