"""Image quality, measured here: a small classifier trained on the image data (`classifier`), and the Fréchet
distance between its features over two sample sets (`frechet`), read against the AR-vs-AR floor."""
