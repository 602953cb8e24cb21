"""After the forward: pooling token rows (`pool`), Dense heads (`heads`), SPLADE (`sparse`), and the
answers each unit gets from a batch's outputs (`outputs`)."""
