"""Classification: the Inference API's text- and zero-shot-classification, TEI's `/predict`."""
