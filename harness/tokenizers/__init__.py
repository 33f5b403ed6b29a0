"""The tokenizers shared by the frontend, the load generator and the datasets (tekken among them)."""
