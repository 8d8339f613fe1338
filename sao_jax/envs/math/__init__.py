"""Tool-integrated math: the environment (`tool`), generated tasks (`tasks`) and
answer checking (`answers`)."""
