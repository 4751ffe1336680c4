"""One folder per published algorithm; see README.md ("How a baseline folder looks")."""
