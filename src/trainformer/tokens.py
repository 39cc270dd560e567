"""The special tokens every vocabulary starts with, and their ids.

The ground floor because both sides need them: data/ writes them into vocab.txt and frames
examples with them; model/ (search: [CLS] starts a decode, [SEP] ends it) and export/ read
the ids, and model never imports data.
"""

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
PAD_ID, UNK_ID, CLS_ID, SEP_ID, MASK_ID = range(len(SPECIAL_TOKENS))
NUM_SPECIAL = len(SPECIAL_TOKENS)  # ids below this are special: never masked, replaced or proposed
