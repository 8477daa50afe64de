"""What a deploy feeds the model: the model itself, its data, and the recipe slices stages name."""
