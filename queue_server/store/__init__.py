"""PostgreSQL: the tables and every statement the server runs against them."""
