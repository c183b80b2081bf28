import typer
app = typer.Typer()
