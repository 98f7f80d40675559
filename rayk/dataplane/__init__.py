"""rayk's data plane: records move between rayk's own processes over direct, authenticated
connections (frames.py, handshake.py, endpoint.py, connection.py), while Ray keeps
placement, supervision and control (see DESIGN.md, "Data plane")."""
